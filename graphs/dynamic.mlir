// Fully dynamic shapes: center each row, scale it by its max magnitude, add a row bias.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x?xf32>, tensor<?xf32>) -> (tensor<?x?xf32>, tensor<?x1xf32>), sym_name = "main"}> ({
  ^bb0(%x: tensor<?x?xf32>, %b: tensor<?xf32>):
    %mean = "semantic.reduce_mean"(%x) {axes = array<i64: 1>, keepdims = true} : (tensor<?x?xf32>) -> tensor<?x1xf32>
    %c = "semantic.sub"(%x, %mean) : (tensor<?x?xf32>, tensor<?x1xf32>) -> tensor<?x?xf32>
    %a = "semantic.abs"(%c) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %m = "semantic.reduce_max"(%a) {axes = array<i64: -1>, keepdims = true} : (tensor<?x?xf32>) -> tensor<?x1xf32>
    %one = "semantic.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %d = "semantic.add"(%m, %one) : (tensor<?x1xf32>, tensor<f32>) -> tensor<?x1xf32>
    %n = "semantic.div"(%c, %d) : (tensor<?x?xf32>, tensor<?x1xf32>) -> tensor<?x?xf32>
    %y = "semantic.add"(%n, %b) : (tensor<?x?xf32>, tensor<?xf32>) -> tensor<?x?xf32>
    "func.return"(%y, %mean) : (tensor<?x?xf32>, tensor<?x1xf32>) -> ()
  }) : () -> ()
}) : () -> ()
