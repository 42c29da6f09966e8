"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x4096xf32>, tensor<4096xf32>) -> tensor<?x4096xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x4096xf32>, %b: tensor<4096xf32>):
    %0 = "semantic.add"(%x, %b) : (tensor<?x4096xf32>, tensor<4096xf32>) -> tensor<?x4096xf32>
    %1 = "semantic.gelu"(%0) {approximate = "none"} : (tensor<?x4096xf32>) -> tensor<?x4096xf32>
    "func.return"(%1) : (tensor<?x4096xf32>) -> ()
  }) : () -> ()
}) : () -> ()
