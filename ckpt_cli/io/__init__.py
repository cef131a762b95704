"""Reading and writing model files: load, save, serialize, external data, safe writes, and the
session settings a written model carries."""
