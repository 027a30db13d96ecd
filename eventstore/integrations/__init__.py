"""Adapters to the clients chat apps already use; each imports its peer only when used.

- :mod:`eventstore.integrations.ai_sdk` — the Vercel AI SDK's UI message stream (``useChat``),
  both ways: what the store records as stream chunks and messages, and a chat request as
  actions (no Python peer: extra ``[ai-sdk]`` is empty).
- :mod:`eventstore.integrations.openai_agents` — a session of the OpenAI Agents SDK
  (``openai-agents``) on the store (extra ``[openai-agents]``).
"""
