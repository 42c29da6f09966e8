// GELU in its tanh approximation.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x4096xf32>) -> tensor<?x4096xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x4096xf32>):
    %0 = "semantic.gelu"(%x) {approximate = "tanh"} : (tensor<?x4096xf32>) -> tensor<?x4096xf32>
    "func.return"(%0) : (tensor<?x4096xf32>) -> ()
  }) : () -> ()
}) : () -> ()
