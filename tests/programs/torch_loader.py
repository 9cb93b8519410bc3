"""A classifier fed by torch's own pipeline, as keras.io's torch examples
feed one (the GAN of "Customizing what happens in fit()" on torch): fit with
a DataLoader over a TensorDataset, in batches of 33 (the last one short),
validation from another DataLoader, then evaluate and predict on one."""
from harness import compile, digits, finish  # noqa: I001

import keras
import torch

keras.utils.set_random_seed(9)
x, y = digits(400)
train = torch.utils.data.TensorDataset(torch.from_numpy(x[:340]), torch.from_numpy(y[:340]))
held = torch.utils.data.TensorDataset(torch.from_numpy(x[340:]), torch.from_numpy(y[340:]))
train_loader = torch.utils.data.DataLoader(train, batch_size=33, shuffle=False)
held_loader = torch.utils.data.DataLoader(held, batch_size=33, shuffle=False)

model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(24, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(train_loader, validation_data=held_loader, epochs=2, verbose=0)
evaluation = model.evaluate(held_loader, verbose=0)
predictions = model.predict(held_loader, verbose=0)
finish(model, history, evaluation, predictions=predictions)
