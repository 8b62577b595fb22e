# stand-in for an engine we cannot drive: run the model at the fused level and np.save its outputs
import sys, numpy as np, onnxruntime as ort
session, out, *config = sys.argv[1:]
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
for kv in config:
    so.add_session_config_entry(*kv.split("=", 1))
sess = ort.InferenceSession(f"{session}/model.onnx", so, providers=["CPUExecutionProvider"])
with np.load(f"{session}/input.npz", allow_pickle=False) as z:
    feeds = {k: z[k][0] for k in z.files}
np.savez(out, **dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))
