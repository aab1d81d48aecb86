"""Wire shapes: the annotations, resources and JSON documents gpupool exchanges, and their validation."""
