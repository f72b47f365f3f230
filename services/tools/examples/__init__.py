"""Example ToolService / EnvironmentService servers: `python -m tandem.services.tools.examples.server`."""
