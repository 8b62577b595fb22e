# golden: a classifier head in FP32 (fixed seed, eval mode); the "engine": the same in FP16
import os, numpy as np
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 256)).astype(np.float32)
w = (rng.standard_normal((256, 1000)) / 16).astype(np.float32)
logits = x @ w
probs = np.exp(logits - logits.max(-1, keepdims=True)); probs /= probs.sum(-1, keepdims=True)
os.makedirs("golden", exist_ok=True); os.makedirs("trt", exist_ok=True)
np.save("golden/logits.npy", logits)
np.save("golden/probs.npy", probs)
l16 = (x.astype(np.float16) @ w.astype(np.float16))
np.save("trt/output_0.npy", l16.view(np.uint16))       # FP16 binding dumped as raw 16-bit words
np.save("trt/output_1.npy", l16.astype(np.float32))     # the engine's probs binding holds logits (no softmax)
np.save("trt/output_0_swapped.npy", l16[[1, 0, 2, 3]])  # a batch served in another order
