"""The sweep spec: its dataclass, each field's rules, the rules across fields, spec files, the variables a
spec may set."""
