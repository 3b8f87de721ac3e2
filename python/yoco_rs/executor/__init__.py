"""The executor: KV tensors, the model forward split into self- and cross-decoder, the sampler."""
