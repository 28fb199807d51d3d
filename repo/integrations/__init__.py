"""Session backends for the agent frameworks, each on sessionrepo's public API.

One module a framework, each importing only its own framework (installed by its extra):

- ``sessionrepo.integrations.openai_agents``: ``SessionRepoSession``, the OpenAI Agents
  SDK's ``Session`` (extra ``openai-agents``);
- ``sessionrepo.integrations.langchain``: ``SessionRepoChatMessageHistory``, a LangChain
  ``BaseChatMessageHistory`` (extra ``langchain``);
- ``sessionrepo.integrations.adk``: ``SessionRepoSessionService``, a Google ADK
  ``BaseSessionService`` (extra ``adk``).

Nothing in sessionrepo imports this package, so the core never needs a framework.
"""
