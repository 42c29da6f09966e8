// Row softmax over the last axis of a batch of 4096-wide rows.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x4096xf32>) -> tensor<?x4096xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x4096xf32>):
    %0 = "semantic.softmax"(%x) {axis = -1 : i64} : (tensor<?x4096xf32>) -> tensor<?x4096xf32>
    "func.return"(%0) : (tensor<?x4096xf32>) -> ()
  }) : () -> ()
}) : () -> ()
