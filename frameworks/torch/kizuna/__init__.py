"""kizuna from Python. `import kizuna.torch` registers the torch.distributed backend "kizuna"."""
