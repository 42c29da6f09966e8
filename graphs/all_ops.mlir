// Every semantic op at least once, on small static shapes; every op's domain is
// safe for random normal inputs (log/sqrt/rsqrt/reciprocal/pow see values >= 0 or >= 1).
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8x4xf32>, tensor<8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x4xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<1x8xf32>, tensor<f32>), sym_name = "main"}> ({
  ^bb0(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %w: tensor<8x4xf32>, %g: tensor<8xf32>, %b: tensor<8xf32>):
    // constants: a scalar splat and a full vector
    %one = "semantic.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %cv = "semantic.constant"() {value = dense<[5.000000e-01, -1.000000e+00, 2.000000e+00, 2.500000e-01, -7.500000e-01, 1.500000e+00, 0.000000e+00, 3.000000e+00]> : tensor<8xf32>} : () -> tensor<8xf32>
    // unary ops; positive operands are built as abs(v) + 1
    %neg = "semantic.neg"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %ax = "semantic.abs"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %px = "semantic.add"(%ax, %one) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %ay = "semantic.abs"(%y) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %py = "semantic.add"(%ay, %one) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %log = "semantic.log"(%px) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %exp = "semantic.exp"(%y) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %logexp = "semantic.log"(%exp) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %sqrt = "semantic.sqrt"(%ax) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %rsqrt = "semantic.rsqrt"(%py) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %tanh = "semantic.tanh"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %sig = "semantic.sigmoid"(%y) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %relu = "semantic.relu"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %erf = "semantic.erf"(%y) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %sin = "semantic.sin"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %cos = "semantic.cos"(%y) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %rcp = "semantic.reciprocal"(%px) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %floor = "semantic.floor"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %gelu = "semantic.gelu"(%x) {approximate = "none"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %gelut = "semantic.gelu"(%y) {approximate = "tanh"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    // binary ops, with broadcasting of a row vector and a scalar
    %add = "semantic.add"(%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %sub = "semantic.sub"(%add, %neg) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %mul = "semantic.mul"(%sub, %cv) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %div = "semantic.div"(%mul, %py) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %max = "semantic.max"(%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %min = "semantic.min"(%x, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %pow = "semantic.pow"(%px, %y) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // comparisons: every predicate, counted through cast i1 -> f32 and select
    %lt = "semantic.cmp"(%x, %y) {predicate = "lt"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
    %le = "semantic.cmp"(%x, %y) {predicate = "le"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
    %gt = "semantic.cmp"(%x, %y) {predicate = "gt"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
    %ge = "semantic.cmp"(%x, %one) {predicate = "ge"} : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xi1>
    %eq = "semantic.cmp"(%floor, %x) {predicate = "eq"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
    %ne = "semantic.cmp"(%x, %cv) {predicate = "ne"} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xi1>
    %ltf = "semantic.cast"(%lt) : (tensor<4x8xi1>) -> tensor<4x8xf32>
    %lef = "semantic.cast"(%le) : (tensor<4x8xi1>) -> tensor<4x8xf32>
    %eqf = "semantic.cast"(%eq) : (tensor<4x8xi1>) -> tensor<4x8xf32>
    %s0 = "semantic.select"(%gt, %x, %tanh) : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %s1 = "semantic.select"(%ge, %s0, %one) : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %s2 = "semantic.select"(%ne, %s1, %sig) : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // casts: f32 -> f16 -> f32
    %h = "semantic.cast"(%x) : (tensor<4x8xf32>) -> tensor<4x8xf16>
    %hh = "semantic.mul"(%h, %h) : (tensor<4x8xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %hf = "semantic.cast"(%hh) : (tensor<4x8xf16>) -> tensor<4x8xf32>
    // sum every elementwise result into one output
    %e0 = "semantic.add"(%log, %logexp) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e1 = "semantic.add"(%e0, %sqrt) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e2 = "semantic.add"(%e1, %rsqrt) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e3 = "semantic.add"(%e2, %relu) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e4 = "semantic.add"(%e3, %erf) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e5 = "semantic.add"(%e4, %sin) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e6 = "semantic.add"(%e5, %cos) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e7 = "semantic.add"(%e6, %rcp) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e8 = "semantic.add"(%e7, %gelu) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e9 = "semantic.add"(%e8, %gelut) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e10 = "semantic.add"(%e9, %div) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e11 = "semantic.sub"(%e10, %max) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e12 = "semantic.add"(%e11, %min) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e13 = "semantic.add"(%e12, %pow) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e14 = "semantic.add"(%e13, %ltf) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e15 = "semantic.add"(%e14, %lef) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e16 = "semantic.add"(%e15, %eqf) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e17 = "semantic.add"(%e16, %s2) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %e18 = "semantic.add"(%e17, %hf) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // layout ops
    %r = "semantic.reshape"(%x) : (tensor<4x8xf32>) -> tensor<8x4xf32>
    %t = "semantic.transpose"(%r) {permutation = array<i64: 1, 0>} : (tensor<8x4xf32>) -> tensor<4x8xf32>
    %bb = "semantic.broadcast_to"(%b) : (tensor<8xf32>) -> tensor<4x8xf32>
    %l0 = "semantic.add"(%t, %bb) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // contraction and normalizations
    %mm = "semantic.matmul"(%x, %w) : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
    %sm = "semantic.softmax"(%mm) {axis = -1 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %ln = "semantic.layernorm"(%x, %g, %b) {axis = -1 : i64, epsilon = 1.0e-05 : f32} : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %rms = "semantic.rmsnorm"(%y, %g) {axis = -1 : i64, epsilon = 1.0e-05 : f32} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %n0 = "semantic.add"(%ln, %rms) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    // reductions
    %rs = "semantic.reduce_sum"(%x) {axes = array<i64: 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<4xf32>
    %rmax = "semantic.reduce_max"(%y) {axes = array<i64: 0>, keepdims = true} : (tensor<4x8xf32>) -> tensor<1x8xf32>
    %rmin = "semantic.reduce_min"(%x) {axes = array<i64: -1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<4xf32>
    %rmean = "semantic.reduce_mean"(%y) {axes = array<i64: 0, 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<f32>
    %r0 = "semantic.add"(%rs, %rmin) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%e18, %l0, %sm, %n0, %r0, %rmax, %rmean) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x4xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<1x8xf32>, tensor<f32>) -> ()
  }) : () -> ()
}) : () -> ()
