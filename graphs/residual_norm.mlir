// A transformer residual connection followed by layer normalization.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x1024xf32>, tensor<?x1024xf32>, tensor<1024xf32>, tensor<1024xf32>) -> (tensor<?x1024xf32>, tensor<?x1024xf32>), sym_name = "main"}> ({
  ^bb0(%x: tensor<?x1024xf32>, %residual: tensor<?x1024xf32>, %gamma: tensor<1024xf32>, %beta: tensor<1024xf32>):
    %h = "semantic.add"(%x, %residual) : (tensor<?x1024xf32>, tensor<?x1024xf32>) -> tensor<?x1024xf32>
    %y = "semantic.layernorm"(%h, %gamma, %beta) {axis = -1 : i64, epsilon = 1.0e-05 : f32} : (tensor<?x1024xf32>, tensor<1024xf32>, tensor<1024xf32>) -> tensor<?x1024xf32>
    "func.return"(%y, %h) : (tensor<?x1024xf32>, tensor<?x1024xf32>) -> ()
  }) : () -> ()
}) : () -> ()
