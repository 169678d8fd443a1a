"""An OpenAI-compatible HTTP gateway served by a rollout replica (docs/gateway.md).

``chat.py`` (messages to token ids, tokenised once), ``sessions.py`` (the recorded
trajectories: pure state), ``api.py`` (the request schema), ``server.py`` (the HTTP
server: starlette + uvicorn, the ``gateway`` extra), ``replica.py`` (started by the
rollout replica). Importing this package imports no HTTP library.
"""
