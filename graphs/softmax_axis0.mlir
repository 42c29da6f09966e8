// Column softmax: normalize over the first axis, columns are dynamic.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<64x?xf32>) -> tensor<64x?xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<64x?xf32>):
    %0 = "semantic.softmax"(%x) {axis = 0 : i64} : (tensor<64x?xf32>) -> tensor<64x?xf32>
    "func.return"(%0) : (tensor<64x?xf32>) -> ()
  }) : () -> ()
}) : () -> ()
