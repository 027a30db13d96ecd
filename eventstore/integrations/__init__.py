"""Adapters to the clients chat apps already use; each imports its peer only when used.

- :mod:`eventstore.integrations.openai_agents` — a session of the OpenAI Agents SDK
  (``openai-agents``) on the store (extra ``[openai-agents]``).
"""
