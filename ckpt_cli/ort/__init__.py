"""What is specific to ONNX Runtime: the ops it registers beyond onnx's own schemas."""
