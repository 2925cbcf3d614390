"""Wire-independent protocol types shared by every layer: tensors, requests, errors."""
