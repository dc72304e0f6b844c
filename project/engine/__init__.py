"""The engine: everything that is neither your task, your data nor your net. You can leave it alone.

What a task subclasses is ``project.engine.task.Task``; what a DataModule subclasses is
``project.engine.datamodule.DataModule``; the error they raise for a bad config value is
``project.engine.errors.ConfigError``. (Imported from their modules, not from here: ``make runs`` imports this
package without loading torch.)
"""
