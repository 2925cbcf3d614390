"""`naiad navigate`: Model Navigator's convert / check / measure / package for ONNX (and PyTorch when installed)."""
