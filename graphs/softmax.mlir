// Row softmax over the last axis: any batch of rows, any row width.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x?xf32>) -> tensor<?x?xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x?xf32>):
    %0 = "semantic.softmax"(%x) {axis = -1 : i64} : (tensor<?x?xf32>) -> tensor<?x?xf32>
    "func.return"(%0) : (tensor<?x?xf32>) -> ()
  }) : () -> ()
}) : () -> ()
