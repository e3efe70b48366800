"""What every layer runs on: the error tree, the package's version, the event loop (asyncio or
trio), telemetry, the process's CUDA fate. Nothing is imported here: ``import asyncgraph`` loads
this folder with the error tree."""
