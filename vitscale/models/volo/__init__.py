"""VOLO family (outlook attention + token labeling): registered by its own module."""
