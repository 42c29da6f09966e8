// Every reduction kind, with and without keepdims, over one or both axes.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<64x128xf32>) -> (tensor<64xf32>, tensor<1x128xf32>, tensor<64xf32>, tensor<f32>), sym_name = "main"}> ({
  ^bb0(%x: tensor<64x128xf32>):
    %0 = "semantic.reduce_sum"(%x) {axes = array<i64: 1>, keepdims = false} : (tensor<64x128xf32>) -> tensor<64xf32>
    %1 = "semantic.reduce_max"(%x) {axes = array<i64: 0>, keepdims = true} : (tensor<64x128xf32>) -> tensor<1x128xf32>
    %2 = "semantic.reduce_min"(%x) {axes = array<i64: 1>, keepdims = false} : (tensor<64x128xf32>) -> tensor<64xf32>
    %3 = "semantic.reduce_mean"(%x) {axes = array<i64: 0, 1>, keepdims = false} : (tensor<64x128xf32>) -> tensor<f32>
    "func.return"(%0, %1, %2, %3) : (tensor<64xf32>, tensor<1x128xf32>, tensor<64xf32>, tensor<f32>) -> ()
  }) : () -> ()
}) : () -> ()
