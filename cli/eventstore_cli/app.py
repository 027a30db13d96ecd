"""Placeholder; the CLI is built in cli/eventstore_cli/."""
import typer

app = typer.Typer()


def main() -> None:
    app()
