"""Report code: terminal summaries now; frames, seaborn figures and the HTML page build on these."""
