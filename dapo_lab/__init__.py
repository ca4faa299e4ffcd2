"""DAPO Lab's console script, `dapo`: one dispatcher over the subcommands every layer registers."""
