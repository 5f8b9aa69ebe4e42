"""Translations between the outside world and the plugin: they translate, never decide."""
