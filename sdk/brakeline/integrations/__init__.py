"""Framework integrations, each imported on demand (they import their framework):

- ``brakeline.integrations.lightning.BrakelineCallback`` for (PyTorch) Lightning
- ``brakeline.integrations.huggingface.BrakelineCallback`` for the Hugging Face Trainer
"""
