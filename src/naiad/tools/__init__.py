"""Tools around the server: perf (load generator), llm (GenAI-Perf), analyze (config search), navigate (convert).

They talk to any KServe v2 server over the wire and import nothing from the server's internals
(only naiad.protocol / naiad.config tables), so `import naiad.tools` stays light.
"""
