"""Backends: one module per framework behind the Backend/ModelInstance protocols."""
