// A long fusible chain of elementwise ops with a broadcast row vector.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x?xf32>, tensor<1x?xf32>) -> tensor<?x?xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x?xf32>, %row: tensor<1x?xf32>):
    %0 = "semantic.mul"(%x, %row) : (tensor<?x?xf32>, tensor<1x?xf32>) -> tensor<?x?xf32>
    %1 = "semantic.add"(%0, %x) : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
    %2 = "semantic.tanh"(%1) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %3 = "semantic.neg"(%2) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %4 = "semantic.exp"(%3) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %5 = "semantic.sub"(%4, %row) : (tensor<?x?xf32>, tensor<1x?xf32>) -> tensor<?x?xf32>
    %6 = "semantic.abs"(%5) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %7 = "semantic.sqrt"(%6) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %8 = "semantic.sigmoid"(%7) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %9 = "semantic.max"(%8, %row) : (tensor<?x?xf32>, tensor<1x?xf32>) -> tensor<?x?xf32>
    %10 = "semantic.relu"(%9) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %11 = "semantic.mul"(%10, %10) : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
    %12 = "semantic.min"(%11, %x) : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
    %13 = "semantic.sin"(%12) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    "func.return"(%13) : (tensor<?x?xf32>) -> ()
  }) : () -> ()
}) : () -> ()
