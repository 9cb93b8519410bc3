"""A purely subclassed model (`__init__` + `call`, as the Keras guide
"Making new layers and models via subclassing" writes one), never built
before fit: Keras builds it from the first batch. Then evaluate, predict,
save to a .keras file and load it back (the class registered as
serializable, with the get_config its constructor argument needs)."""
from harness import compile, digits, finish, path  # noqa: I001

import keras


@keras.saving.register_keras_serializable(package="programs")
class MLP(keras.Model):
    def __init__(self, num_classes=10, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.dense_1 = keras.layers.Dense(32, activation="relu")
        self.dense_2 = keras.layers.Dense(16, activation="relu")
        self.classifier = keras.layers.Dense(num_classes, activation="softmax")

    def call(self, inputs):
        x = self.dense_1(inputs)
        x = self.dense_2(x)
        return self.classifier(x)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes}


keras.utils.set_random_seed(16)
x, y = digits()
model = MLP(10)
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
predictions = model.predict(x[:16], batch_size=8, verbose=0)
model.save(path("model.keras"))
loaded = keras.models.load_model(path("model.keras"))
finish(model, history, evaluation, predictions=predictions,
       by_loaded=loaded.predict(x[:16], batch_size=8, verbose=0),
       loaded_class=type(loaded).__name__)
