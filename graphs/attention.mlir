// Scaled dot-product attention for one head: softmax(q k^T / sqrt(64)) v.
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x128x64xf32>, tensor<?x128x64xf32>, tensor<?x128x64xf32>) -> tensor<?x128x64xf32>, sym_name = "main"}> ({
  ^bb0(%q: tensor<?x128x64xf32>, %k: tensor<?x128x64xf32>, %v: tensor<?x128x64xf32>):
    %kt = "semantic.transpose"(%k) {permutation = array<i64: 0, 2, 1>} : (tensor<?x128x64xf32>) -> tensor<?x64x128xf32>
    %s = "semantic.matmul"(%q, %kt) : (tensor<?x128x64xf32>, tensor<?x64x128xf32>) -> tensor<?x128x128xf32>
    %scale = "semantic.constant"() {value = dense<1.250000e-01> : tensor<f32>} : () -> tensor<f32>
    %ss = "semantic.mul"(%s, %scale) : (tensor<?x128x128xf32>, tensor<f32>) -> tensor<?x128x128xf32>
    %p = "semantic.softmax"(%ss) {axis = -1 : i64} : (tensor<?x128x128xf32>) -> tensor<?x128x128xf32>
    %o = "semantic.matmul"(%p, %v) : (tensor<?x128x128xf32>, tensor<?x128x64xf32>) -> tensor<?x128x64xf32>
    "func.return"(%o) : (tensor<?x128x64xf32>) -> ()
  }) : () -> ()
}) : () -> ()
