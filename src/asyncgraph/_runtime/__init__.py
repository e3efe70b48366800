"""What every layer runs on: the event loop (asyncio or trio), telemetry, the process's CUDA
fate."""
