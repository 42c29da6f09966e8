// C = A @ B in f32: the FFMA matmul's tuning program (benchmarks/tune/matmul_f32.yaml).
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>, sym_name = "main"}> ({
  ^bb0(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>):
    %0 = "semantic.matmul"(%a, %b) : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
    "func.return"(%0) : (tensor<?x?xf32>) -> ()
  }) : () -> ()
}) : () -> ()
