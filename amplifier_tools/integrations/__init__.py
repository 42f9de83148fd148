"""Adapters that put the host under the agent frameworks people already run.

One module per framework, each an optional extra; nothing in the core imports them, and importing
this package imports no framework:

- :mod:`amplifier_tools.integrations.openai_agents` — OpenAI Agents SDK ``FunctionTool``s (extra
  ``openai-agents``);
- :mod:`amplifier_tools.integrations.pydantic_ai` — a Pydantic AI toolset (extra ``pydantic-ai``);
- :mod:`amplifier_tools.integrations.langchain` — LangChain ``BaseTool``s, for ``create_agent`` and
  LangGraph's ``ToolNode`` (extra ``langchain``).

Every adapter runs each call through ``ToolHost.call`` (validation, hooks, policies, audit), passes
the framework's tool-call id as the call id, and hands the model the typed error text of a failed
call instead of raising. docs/integrations.md says what each one does not carry over.
"""
