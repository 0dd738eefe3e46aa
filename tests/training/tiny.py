"""A tiny experiment (seconds on CPU) for the training-system tests."""

TINY_OVERRIDE = (
    "data.num_train_images=48,data.num_val_images=12,data.num_test_images=12,data.image_size=32,"
    "model.embedding_dim=16,model.text.hidden_size=16,model.text.num_layers=1,model.text.num_attention_heads=2,"
    "model.text.intermediate_size=32,model.image.image_size=32,model.image.stackwise_filters=[4,8,8,8],"
    "train.batch_size=16,train.epochs=2,train.steps_per_epoch=3,train.verbose=0,train.backup_every_steps=2,"
    "evaluation.every_n_epochs=1,evaluation.distractors=0"
)
