"""`reroll serve`: the TorchEngine behind an OpenAI-compatible HTTP API (`app`), over a
serving core that turns requests into engine records (`backend`), with the request bodies it
accepts (`schemas`) and the response shapes it sends (`openai_format`). The only package that
imports starlette and uvicorn (the ``serve`` extra); the CLI glue is `command`."""
