// Packed weights (delegate.gpu.layout.pack_conv_weights) read as 4x4 matrices: column k of the
// block at w holds input lane k's weights for the block's 4 output channels, so the block times
// an input vector is those 4 channels' share of the sum.
fn weight_block(w: i32) -> mat4x4<A> {
  return mat4x4<A>(VA(weights[w]), VA(weights[w + 1]), VA(weights[w + 2]), VA(weights[w + 3]));
}
