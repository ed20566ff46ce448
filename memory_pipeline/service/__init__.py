"""Memory as a service: `memory serve` (HTTP API + MCP over streamable HTTP) and `memory mcp` (stdio).

Modules: ``core`` (``MemoryService``: search, read lines, write notes, status, index; no HTTP),
``assets`` (the AgentOS multimodal assets), ``retrieval`` (the ``retrievalMode`` contract),
``warm`` (the warm searcher that follows new commits), ``files`` (contained writes and names),
``schemas`` (request/response models), ``routes_health`` / ``routes_memory`` / ``routes_rag``
(the HTTP routes), ``mcp_server`` (the MCP tools), ``auth`` (bearer token), ``limits`` (body
cap), ``serverfile`` (the address in the data folder), ``client`` (`memory search` through a
running server), ``app`` (``create_app``), ``run`` (`memory serve`).

Nothing here is imported by `memory index` or `memory search` unless a server is in play, but
``serverfile``: an index run reads it to give a running server's searches the CPU first
(``memory_pipeline.priority``) and to fold its new rows into the indices at once (``stages.write``).
"""
