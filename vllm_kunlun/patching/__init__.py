"""Changes to vLLM / torch behaviour: file patch sets and named runtime patches."""
