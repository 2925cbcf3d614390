"""Server settings and model configuration (config.pbtxt) handling."""
