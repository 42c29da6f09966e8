// RMS normalization over the last axis with a learned scale.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x4096xf32>, tensor<4096xf32>) -> tensor<?x4096xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x4096xf32>, %gamma: tensor<4096xf32>):
    %0 = "semantic.rmsnorm"(%x, %gamma) {axis = -1 : i64, epsilon = 1.0e-05 : f32} : (tensor<?x4096xf32>, tensor<4096xf32>) -> tensor<?x4096xf32>
    "func.return"(%0) : (tensor<?x4096xf32>) -> ()
  }) : () -> ()
}) : () -> ()
