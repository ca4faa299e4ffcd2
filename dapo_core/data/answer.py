"""The text a reply's answer line begins with, below every task and the loaders (which render it
into the `chat-answer` and `raw-answer` templates' prompts) so that a task's demonstrations can
use it without importing the loaders that import the task."""

ANSWER_PREFIX = "Answer: "
"""`chat-answer` begins the assistant's reply with this in the prompt (dapo_core.data.arithmetic);
`raw-answer` ends the prompt with it (the lookup task)."""
