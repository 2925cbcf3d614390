"""The KServe v2 gRPC frontend (inference.GRPCInferenceService) built on tritonclient's generated stubs."""
