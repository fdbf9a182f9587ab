"""Probes: load a model, replay a prompt under many batch conditions, diff the streams.

Modules here may import torch inside functions; this package's __init__ imports nothing.
"""
