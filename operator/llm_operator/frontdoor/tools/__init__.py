"""OpenAI's tools and tool_choice (docs/architecture.md, "Structured outputs, tools, log
probabilities and n: the design"): the request's checks and guides (request.py), the tool calls
read out of the model's text as it streams (parsers.py), and the messages that carry them back to
the chat template (messages.py)."""
