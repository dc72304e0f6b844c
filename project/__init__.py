"""A PyTorch Lightning project template: see README.md (and its pages under docs/)."""
