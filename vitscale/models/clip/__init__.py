"""CLIP family (image-text contrastive): registered by its own module."""
