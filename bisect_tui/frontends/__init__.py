"""Front ends: where a model comes from before it is an ONNX file the core can triage.

Each one turns a framework model into the session's ONNX model and adds the
framework's own golden data as a reference (`bisect_tui.core.reference`).
PyTorch today (`frontends.torch`); frameworks are imported lazily, only when used.
"""
