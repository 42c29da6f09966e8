// C = A @ B in bf16 (f32 accumulate): the tensor-core matmul's tuning program.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x?xbf16>, tensor<?x?xbf16>) -> tensor<?x?xbf16>, sym_name = "main"}> ({
  ^bb0(%a: tensor<?x?xbf16>, %b: tensor<?x?xbf16>):
    %0 = "semantic.matmul"(%a, %b) : (tensor<?x?xbf16>, tensor<?x?xbf16>) -> tensor<?x?xbf16>
    "func.return"(%0) : (tensor<?x?xbf16>) -> ()
  }) : () -> ()
}) : () -> ()
