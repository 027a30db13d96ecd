"""eventstore: AI chat sessions as an event-sourced log with time travel."""
