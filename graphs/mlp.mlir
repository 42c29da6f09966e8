// A transformer feed-forward block: x @ w1 + b1 -> gelu(tanh) -> @ w2 + b2.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x256xf32>, tensor<256x1024xf32>, tensor<1024xf32>, tensor<1024x256xf32>, tensor<256xf32>) -> tensor<?x256xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x256xf32>, %w1: tensor<256x1024xf32>, %b1: tensor<1024xf32>, %w2: tensor<1024x256xf32>, %b2: tensor<256xf32>):
    %h = "semantic.matmul"(%x, %w1) : (tensor<?x256xf32>, tensor<256x1024xf32>) -> tensor<?x1024xf32>
    %hb = "semantic.add"(%h, %b1) : (tensor<?x1024xf32>, tensor<1024xf32>) -> tensor<?x1024xf32>
    %a = "semantic.gelu"(%hb) {approximate = "tanh"} : (tensor<?x1024xf32>) -> tensor<?x1024xf32>
    %o = "semantic.matmul"(%a, %w2) : (tensor<?x1024xf32>, tensor<1024x256xf32>) -> tensor<?x256xf32>
    %ob = "semantic.add"(%o, %b2) : (tensor<?x256xf32>, tensor<256xf32>) -> tensor<?x256xf32>
    "func.return"(%ob) : (tensor<?x256xf32>) -> ()
  }) : () -> ()
}) : () -> ()
