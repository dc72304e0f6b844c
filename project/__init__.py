"""A PyTorch Lightning project template: see README.md."""
