"""The Server facade, model lifecycle, request validation and response building."""
